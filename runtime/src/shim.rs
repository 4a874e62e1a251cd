//! The per-job supervisor (`wharf shim DIR`). See the crate documentation.
//!
//! ```text
//!  read spec ─▶ open output files as the user ─▶ user namespace ─▶ create container
//!      │                                                               │ start
//!      ▼                                                               ▼
//!  outcome.json ◀─ delete container ◀─ reap ◀─ exit ◀── wait (time limit, SIGTERM = cancel:
//!                                                        TERM all, grace, KILL all)
//! ```
//! Single-threaded by design: it forks, and its signal handling relies on one thread.

use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use libcontainer::container::builder::ContainerBuilder;
use libcontainer::container::Container;
use libcontainer::syscall::syscall::SyscallType;
use nix::sys::resource::{getrlimit, setrlimit, Resource};
use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{getgroups, setfsgid, setfsuid, setgroups, Gid, Pid, Uid};

use crate::cgroup;
use crate::error::{ErrorKind, RuntimeError};
use crate::jobdir::JobDir;
use crate::oci::build_oci_spec;
use crate::spec::{ContainerSpec, Outcome};
use crate::timeline;
use crate::userns::{id_maps, UserNsHolder};

static CANCEL: AtomicBool = AtomicBool::new(false);

extern "C" fn on_cancel(_: libc::c_int) {
    CANCEL.store(true, Ordering::SeqCst);
}

/// Runs the job in `dir` to the end and writes its outcome. Returns the shim's exit status:
/// 0 when an outcome was written.
pub fn main(dir: &Path) -> i32 {
    let jd = JobDir::new(dir.to_path_buf());
    timeline::mark(&jd, "shim");
    let outcome = match jd.read_spec() {
        Ok(spec) => supervise(&jd, &spec),
        Err(e) => Outcome {
            error: Some(e.to_string()),
            ended_ms: crate::now_ms(),
            ..Default::default()
        },
    };
    match JobDir::write_atomic(&jd.outcome(), &outcome) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("wharf shim: cannot write outcome: {e}");
            1
        }
    }
}

fn install_signal_handlers() -> Result<(), RuntimeError> {
    // No SA_RESTART: a cancel must interrupt the wait at once.
    let cancel = SigAction::new(
        SigHandler::Handler(on_cancel),
        SaFlags::empty(),
        SigSet::empty(),
    );
    let ignore = SigAction::new(SigHandler::SigIgn, SaFlags::empty(), SigSet::empty());
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        for sig in [Signal::SIGTERM, Signal::SIGINT] {
            sigaction(sig, &cancel).map_err(|e| RuntimeError::sys("sigaction", e))?;
        }
        for sig in [Signal::SIGHUP, Signal::SIGPIPE] {
            sigaction(sig, &ignore).map_err(|e| RuntimeError::sys("sigaction", e))?;
        }
    }
    Ok(())
}

/// Whether a cancel (SIGTERM/SIGINT to the shim) has arrived.
pub(crate) fn cancelled() -> bool {
    CANCEL.load(Ordering::SeqCst)
}

/// Runs a Docker-backend job: the engine supervises the processes, the shim the job.
fn supervise_docker(jd: &JobDir, spec: &ContainerSpec, target: &crate::DockerTarget) -> Outcome {
    let mut out = Outcome::default();
    let result = install_signal_handlers().and_then(|_| {
        let (o, e) = open_outputs(spec)?;
        // The engine sets the container's limits; ask only for what this node can give.
        let spec = apply_limits(spec)?;
        crate::docker::supervise(jd, &spec, target, o, e, &mut out)
    });
    if let Err(e) = result {
        out.error = Some(e.to_string());
    }
    out.ended_ms = crate::now_ms();
    out
}

fn supervise(jd: &JobDir, spec: &ContainerSpec) -> Outcome {
    if let Some(target) = &spec.docker {
        return supervise_docker(jd, spec, target);
    }
    let mut out = Outcome::default();
    let result = install_signal_handlers().and_then(|_| {
        // The container's init is our grandchild; as subreaper we can wait for it.
        nix::sys::prctl::set_child_subreaper(true)
            .map_err(|e| RuntimeError::sys("PR_SET_CHILD_SUBREAPER", e))?;
        let (stdout, stderr) = open_outputs(spec)?;
        let spec = &apply_limits(spec)?;
        let (uid_map, gid_map) = if spec.remap_root {
            crate::userns::root_maps(spec.uid, spec.gid, &spec.groups)
        } else {
            id_maps(spec.uid, spec.gid, &spec.groups, spec.root_host_id)?
        };
        let mut holder = UserNsHolder::create(&uid_map, &gid_map)?;
        timeline::mark(jd, "identity");
        let mut container = create(jd, spec, &holder, stdout, stderr)?;
        timeline::mark(jd, "created");
        holder.release();
        run(jd, &mut container, spec, &mut out)
    });
    if let Err(e) = result {
        out.error = Some(e.to_string());
        force_cleanup(jd, spec);
    }
    reap_all();
    out.ended_ms = crate::now_ms();
    out
}

fn create(
    jd: &JobDir,
    spec: &ContainerSpec,
    holder: &UserNsHolder,
    stdout: OwnedFd,
    stderr: OwnedFd,
) -> Result<Container, RuntimeError> {
    let mut spec = spec.clone();
    spec.rootfs = crate::rootfs::prepare_root(&spec, jd.path(), &holder.ns_path())?;
    let oci = build_oci_spec(&spec, &holder.ns_path())?;
    let bundle = jd.bundle();
    std::fs::create_dir_all(&bundle).map_err(|e| RuntimeError::io(bundle.display(), e))?;
    // config.json holds the job's environment: root only.
    std::fs::set_permissions(&bundle, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| RuntimeError::io(bundle.display(), e))?;
    oci.save(bundle.join("config.json")).map_err(|e| {
        RuntimeError::new(ErrorKind::Unavailable, format!("writing config.json: {e}"))
    })?;
    timeline::mark(jd, "root");
    let devnull = File::open("/dev/null").map_err(|e| RuntimeError::io("/dev/null", e))?;
    let lc = |what: &str, e: libcontainer::error::LibcontainerError| {
        RuntimeError::new(
            ErrorKind::Unavailable,
            format!("{what} container {}: {e}", spec.id),
        )
    };
    ContainerBuilder::new(spec.id.clone(), SyscallType::default())
        .with_root_path(jd.state())
        .map_err(|e| lc("preparing", e))?
        .with_stdin(devnull)
        .with_stdout(stdout)
        .with_stderr(stderr)
        .as_init(&bundle)
        .with_systemd(false)
        .with_detach(true)
        .build()
        .map_err(|e| lc("creating", e))
}

fn run(
    jd: &JobDir,
    container: &mut Container,
    spec: &ContainerSpec,
    out: &mut Outcome,
) -> Result<(), RuntimeError> {
    if cancelled() {
        out.cancelled = true;
        delete(container, spec);
        return Ok(());
    }
    let started = restore_memlock(container, spec).and_then(|()| {
        container.start().map_err(|e| {
            RuntimeError::new(ErrorKind::Unavailable, format!("starting container: {e}"))
        })
    });
    if let Err(e) = started {
        delete(container, spec);
        return Err(e);
    }
    timeline::mark(jd, "started");
    let started = Instant::now();
    out.started_ms = Some(crate::now_ms());
    if let Some(ms) = out.started_ms {
        let _ = std::fs::write(jd.started(), ms.to_string());
    }
    let Some(init) = container.pid() else {
        delete(container, spec);
        return Err(RuntimeError::new(
            ErrorKind::Unavailable,
            "container has no init pid",
        ));
    };
    let status = wait_init(container, spec, init, started, out);
    match status {
        WaitStatus::Exited(_, code) => out.exit_code = Some(code),
        WaitStatus::Signaled(_, sig, _) => out.signal = Some(sig as i32),
        _ => {}
    }
    // The pid namespace dies with its init, but make sure before the cgroup goes.
    let gone_by = Instant::now() + Duration::from_secs(5);
    while !cgroup::pids(&spec.cgroup_path()).is_empty() && Instant::now() < gone_by {
        let _ = container.kill(Signal::SIGKILL, true);
        reap_all();
        std::thread::sleep(Duration::from_millis(20));
    }
    out.oom = cgroup::oom_kills(&spec.cgroup_path()) > 0;
    delete(container, spec);
    Ok(())
}

/// Waits for the container's init, enforcing the time limit and cancellation.
fn wait_init(
    container: &mut Container,
    spec: &ContainerSpec,
    init: Pid,
    started: Instant,
    out: &mut Outcome,
) -> WaitStatus {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, init.as_raw(), 0) } as i32;
    let pidfd = (raw >= 0).then(|| unsafe { OwnedFd::from_raw_fd(raw) });
    let deadline = spec.time_limit.map(|t| started + Duration::from_secs(t));
    let grace = Duration::from_secs(spec.grace_secs);
    let mut kill_at: Option<Instant> = None;
    loop {
        if let Ok(status @ (WaitStatus::Exited(..) | WaitStatus::Signaled(..))) =
            waitpid(init, Some(WaitPidFlag::WNOHANG))
        {
            return status;
        }
        let now = Instant::now();
        let stopping = out.cancelled || out.timed_out;
        if !stopping && cancelled() {
            out.cancelled = true;
        } else if !stopping && deadline.is_some_and(|d| now >= d) {
            out.timed_out = true;
        }
        if !stopping && (out.cancelled || out.timed_out) {
            let _ = container.kill(Signal::SIGTERM, true);
            kill_at = Some(now + grace);
        }
        if kill_at.is_some_and(|k| now >= k) {
            let _ = container.kill(Signal::SIGKILL, true);
            kill_at = Some(now + Duration::from_secs(1)); // repeat until init is gone
        }
        let next = [deadline.filter(|_| kill_at.is_none()), kill_at]
            .into_iter()
            .flatten()
            .min()
            .map(|t| t.saturating_duration_since(now))
            .unwrap_or(Duration::from_secs(1))
            .min(Duration::from_secs(1));
        let ms = next.as_millis().max(1) as i32;
        match &pidfd {
            Some(fd) => {
                let mut pfd = libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd; EINTR (a cancel) just loops.
                unsafe { libc::poll(&mut pfd, 1, ms) };
            }
            None => std::thread::sleep(Duration::from_millis(ms.min(50) as u64)),
        }
    }
}

fn delete(container: &mut Container, spec: &ContainerSpec) {
    if let Err(e) = container.delete(true) {
        eprintln!("wharf shim: deleting container {}: {e}", spec.id);
    }
}

/// After a shim died without an outcome: kill what is left of its job and remove it.
pub(crate) fn clean_up_after_lost_shim(jd: &JobDir, spec: &ContainerSpec) {
    if let Some(target) = &spec.docker {
        let _ = crate::docker::remove(target, &spec.id);
        return;
    }
    for _ in 0..50 {
        let pids = cgroup::pids(&spec.cgroup_path());
        if pids.is_empty() {
            break;
        }
        for pid in pids {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    force_cleanup(jd, spec);
}

/// After a failed create: remove whatever libcontainer left (state, cgroups).
fn force_cleanup(jd: &JobDir, spec: &ContainerSpec) {
    if let Ok(mut c) = Container::load(jd.state().join(&spec.id)) {
        let _ = c.kill(Signal::SIGKILL, true);
        let _ = c.delete(true);
    }
    for dir in cgroup::cgroup_dirs(&spec.cgroup_path()) {
        let _ = std::fs::remove_dir(dir);
    }
}

/// Reaps every child that has ended, without waiting.
pub(crate) fn reap_all() {
    while let Ok(status) = waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
        if status == WaitStatus::StillAlive {
            break;
        }
    }
}

/// Sets the shim's RLIMIT_MEMLOCK (soft and hard) to `want` (`None` = unlimited), no higher
/// than [`crate::memlock_ceiling`], and returns the limit in force. Inside the container's
/// user namespace a hard limit can never be raised, so the container gets it from outside:
/// inherited, then set again on its init before start ([`restore_memlock`]).
fn set_memlock(want: Option<u64>) -> Result<u64, RuntimeError> {
    set_limit(
        Resource::RLIMIT_MEMLOCK,
        want.unwrap_or(libc::RLIM_INFINITY)
            .min(crate::limits::memlock_ceiling()),
    )
}

/// Gives the created (not yet started) container init the memlock limit in force for the job.
/// libcgroups, when it loads the device filter on a cgroup v2 host, sets the memlock limit of
/// the process doing it to 128 MiB, soft and hard, and the container inherits that; inside the
/// job's user namespace it could never be raised again, so it is set here, from outside, before
/// the user's program runs.
fn restore_memlock(container: &Container, spec: &ContainerSpec) -> Result<(), RuntimeError> {
    let Some(init) = container.pid() else {
        return Err(RuntimeError::new(
            ErrorKind::Unavailable,
            "created container has no init pid",
        ));
    };
    let want = spec.memlock.unwrap_or(libc::RLIM_INFINITY);
    let limit = libc::rlimit {
        rlim_cur: want,
        rlim_max: want,
    };
    // SAFETY: a valid rlimit for the new value and no old-value pointer.
    if unsafe {
        libc::prlimit(
            init.as_raw(),
            libc::RLIMIT_MEMLOCK,
            &limit,
            std::ptr::null_mut(),
        )
    } != 0
    {
        return Err(RuntimeError::io(
            format!("setting the memlock limit of container init {init}"),
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Sets the shim's memlock and stack limits for the job (the container inherits them; the
/// Docker backend passes them to the engine) and returns the spec with the values in force,
/// which the job also sees as `WHARF_MEMLOCK`.
fn apply_limits(spec: &ContainerSpec) -> Result<ContainerSpec, RuntimeError> {
    let memlock = set_memlock(spec.memlock)?;
    let mut spec = spec.clone();
    if let Some(stack) = spec.stack {
        spec.stack = Some(set_limit(Resource::RLIMIT_STACK, stack)?);
    }
    spec.memlock = (memlock != libc::RLIM_INFINITY).then_some(memlock);
    spec.env
        .push(format!("WHARF_MEMLOCK={}", memlock_text(memlock)));
    Ok(spec)
}

/// Sets a resource limit (soft and hard) on the shim, which the container inherits, clamped
/// to the shim's own hard limit when it may not raise it. Returns the limit in force.
fn set_limit(res: Resource, want: u64) -> Result<u64, RuntimeError> {
    let (_, hard) =
        getrlimit(res).map_err(|e| RuntimeError::sys(format!("getrlimit({res:?})"), e))?;
    if setrlimit(res, want, want).is_ok() {
        return Ok(want);
    }
    let clamped = want.min(hard);
    eprintln!("wharf shim: cannot raise {res:?} to {want} (no CAP_SYS_RESOURCE?); using {clamped}");
    setrlimit(res, clamped, clamped)
        .map_err(|e| RuntimeError::sys(format!("setrlimit({res:?})"), e))?;
    Ok(clamped)
}

fn memlock_text(v: u64) -> String {
    if v == libc::RLIM_INFINITY {
        "unlimited".into()
    } else {
        v.to_string()
    }
}

/// Opens the job's output files as the user: with the user's fs ids and groups, so a path the
/// user could not write (or a symlink they planted) cannot be used against root. Mode 0600.
fn open_outputs(spec: &ContainerSpec) -> Result<(OwnedFd, OwnedFd), RuntimeError> {
    let stdout = open_as_user(&spec.stdout, spec)?;
    let stderr = if spec.stderr == spec.stdout {
        stdout.try_clone().map_err(|e| RuntimeError::io("dup", e))?
    } else {
        open_as_user(&spec.stderr, spec)?
    };
    Ok((stdout, stderr))
}

fn open_as_user(path: &Path, spec: &ContainerSpec) -> Result<OwnedFd, RuntimeError> {
    let saved = getgroups().map_err(|e| RuntimeError::sys("getgroups", e))?;
    let groups: Vec<Gid> = spec
        .groups
        .iter()
        .chain([&spec.gid])
        .map(|&g| Gid::from_raw(g))
        .collect();
    setgroups(&groups).map_err(|e| RuntimeError::sys("setgroups", e))?;
    // setfsuid/setfsgid act on this thread only; the shim has one.
    setfsgid(Gid::from_raw(spec.gid));
    setfsuid(Uid::from_raw(spec.uid));
    let opened = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path);
    setfsuid(Uid::from_raw(0));
    setfsgid(Gid::from_raw(0));
    let _ = setgroups(&saved);
    let file = opened.map_err(|e| {
        RuntimeError::io(
            format!(
                "cannot create output file {} as uid {}",
                path.display(),
                spec.uid
            ),
            e,
        )
    })?;
    // Honour 0600 even if the file existed with wider permissions.
    let _ = file.set_permissions(std::fs::Permissions::from_mode(0o600));
    Ok(file.into())
}
