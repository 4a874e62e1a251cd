//! The per-job supervisor (`wharf shim DIR`). See the crate documentation.
//!
//! ```text
//!  read spec ─▶ open output files as the user ─▶ cgroup (v2) ─▶ clone the init ─▶ map its
//!      ids ─▶ prepare the root ─▶ build (the init mounts; meanwhile, on v1, the cgroup is
//!      made and the init moved in) ─▶ start (the init takes the job's ids and execs it)
//!                                                               │
//!  outcome.json ◀─ remove cgroup ◀─ kill what is left ◀─ exit ◀─ wait (time limit, SIGTERM =
//!        ▲                                               cancel: TERM all, grace, KILL all)
//!        └── launch stopped (CANCELLED / TIMEOUT, never started) or failed (the reason)
//! ```
//! Every step of the launch is bounded, and a cancel or the time limit (counted from the
//! shim's start until the job starts) ends it between steps and while it waits: see
//! `Launch`. Single-threaded by design: it forks, and its signal handling relies on one
//! thread.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::sys::resource::{getrlimit, setrlimit, Resource};
use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::as_user::{self, AsUser};
use crate::cgroup_usage as cgroup;
use crate::error::RuntimeError;
use crate::input::Holder;
use crate::jobdir::JobDir;
use crate::output::open_outputs;
use crate::sandbox::userns::id_maps;
use crate::sandbox::{self, Init, InitIo, JobCgroup, Plan};
use crate::spec::{ContainerSpec, Outcome};
use crate::timeline::Timeline;
use wharf_api::fault::FaultCode;

static CANCEL: AtomicBool = AtomicBool::new(false);
/// Set by the launch's alarm: the time limit passed while the job was not started yet.
static LAUNCH_EXPIRED: AtomicBool = AtomicBool::new(false);
/// Whether a launch is under way (its alarm is armed, see [`Launch`]).
static LAUNCHING: AtomicBool = AtomicBool::new(false);

/// How often a stopped launch's alarm interrupts whatever the launch waits on, until it ends.
const STOP_TICK: Duration = Duration::from_millis(100);

extern "C" fn on_cancel(_: libc::c_int) {
    CANCEL.store(true, Ordering::SeqCst);
    // This signal interrupts the call the launch is in; the alarm interrupts any later one.
    if LAUNCHING.load(Ordering::SeqCst) {
        set_alarm(STOP_TICK, STOP_TICK);
    }
}

/// What the agent sends the shim once it wrote a task's input's end
/// ([`crate::JobDir::stdin_end`]) or signal requests ([`crate::signals`]): either only
/// wakes its wait early.
pub const INPUT_ENDED: Signal = Signal::SIGUSR1;

extern "C" fn on_wake(_: libc::c_int) {}

extern "C" fn on_alarm(_: libc::c_int) {
    if LAUNCHING.load(Ordering::SeqCst) && !CANCEL.load(Ordering::SeqCst) {
        LAUNCH_EXPIRED.store(true, Ordering::SeqCst);
    }
}

/// Arms the shim's real-time alarm (SIGALRM) to fire after `first`, then every `every`;
/// both zero disarms it. A plain system call: safe in a signal handler.
fn set_alarm(first: Duration, every: Duration) {
    let tv = |d: Duration| libc::timeval {
        tv_sec: d.as_secs() as libc::time_t,
        tv_usec: libc::suseconds_t::from(d.subsec_micros() as i32),
    };
    let timer = libc::itimerval {
        it_interval: tv(every),
        it_value: tv(first),
    };
    // SAFETY: setitimer with a valid value and no old value asked for.
    unsafe { libc::setitimer(libc::ITIMER_REAL, &timer, std::ptr::null_mut()) };
}

/// Runs the job in `dir` to the end and writes its outcome. Returns the shim's exit status:
/// 0 when an outcome was written.
pub fn main(dir: &Path) -> i32 {
    let jd = JobDir::new(dir.to_path_buf());
    let timeline = Timeline::open(&jd);
    timeline.mark("shim");
    let mut outcome = match jd.read_spec() {
        Ok(spec) => supervise(&jd, &spec, &timeline),
        Err(e) => Outcome {
            error: Some(e.to_string()),
            fault: Some(e.with_code(FaultCode::Supervisor).fault()),
            ended_ms: crate::now_ms(),
            ..Default::default()
        },
    };
    // The agent reports the error at every poll until the job is forgotten: keep it short
    // whatever the job's command (a reason may quote it).
    outcome.error = outcome.error.map(wharf_api::text::bound_message);
    match JobDir::write_atomic(&jd.outcome(), &outcome) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("wharf shim: cannot write outcome: {e}");
            1
        }
    }
}

fn install_signal_handlers() -> Result<(), RuntimeError> {
    // No SA_RESTART: a cancel, or the launch's alarm, must interrupt the wait at once.
    let cancel = SigAction::new(
        SigHandler::Handler(on_cancel),
        SaFlags::empty(),
        SigSet::empty(),
    );
    let alarm = SigAction::new(
        SigHandler::Handler(on_alarm),
        SaFlags::empty(),
        SigSet::empty(),
    );
    let ignore = SigAction::new(SigHandler::SigIgn, SaFlags::empty(), SigSet::empty());
    // The agent's word that a task's input has ended: it only ends the wait for the job early
    // (the wait then looks); calls that may be restarted are.
    let wake = SigAction::new(
        SigHandler::Handler(on_wake),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    // SAFETY: the handlers only store to an atomic, or do nothing.
    unsafe {
        sigaction(INPUT_ENDED, &wake).map_err(|e| RuntimeError::sys("sigaction", e))?;
        for sig in [Signal::SIGTERM, Signal::SIGINT] {
            sigaction(sig, &cancel).map_err(|e| RuntimeError::sys("sigaction", e))?;
        }
        sigaction(Signal::SIGALRM, &alarm).map_err(|e| RuntimeError::sys("sigaction", e))?;
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

/// Why a launch ended before the job ran, other than a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// The job was cancelled (SIGTERM or SIGINT to the shim).
    Cancelled,
    /// The launch outlasted the job's time limit.
    TimedOut,
}

/// How a step of a launch ends early: stopped, or failed with the reason.
#[derive(Debug)]
pub(crate) enum Abort {
    Stop(Stop),
    Failed(RuntimeError),
}

impl Abort {
    /// A failure classified as `code` (unless its own step classified it already); a stop
    /// stays as it is.
    fn code(self, code: FaultCode) -> Abort {
        match self {
            Abort::Failed(e) => Abort::Failed(e.with_code(code)),
            stop => stop,
        }
    }
}

impl From<RuntimeError> for Abort {
    fn from(e: RuntimeError) -> Self {
        Abort::Failed(e)
    }
}

/// The watch over a launch: a cancel, and the time limit, which runs from the shim's start
/// until the job starts (then again from the job's start, see [`wait_init`]). Every step of a
/// launch is bounded; between steps, and while one waits, the launch asks [`Launch::stop`].
///
/// And in case a step would wait on something nobody foresaw (an open of something in a
/// user's image, say): from the time limit, or from a cancel, an alarm without `SA_RESTART`
/// interrupts whatever system call the launch is in, every [`STOP_TICK`], until the launch
/// ends. A call that is retried on EINTR (or a process in uninterruptible sleep) is beyond it.
#[derive(Debug)]
struct Launch {
    deadline: Option<Instant>,
}

impl Launch {
    /// Starts the watch over a launch for a job with this time limit (seconds). The signal
    /// handlers must be installed (SIGALRM's default kills).
    fn start(time_limit: Option<u64>) -> Launch {
        let limit = time_limit.map(Duration::from_secs);
        LAUNCHING.store(true, Ordering::SeqCst);
        match limit {
            // A zero value would disarm it: a zero limit fires at once.
            Some(limit) => set_alarm(limit.max(Duration::from_micros(1)), STOP_TICK),
            None if cancelled() => set_alarm(STOP_TICK, STOP_TICK),
            None => {}
        }
        Launch {
            deadline: limit.map(|t| Instant::now() + t),
        }
    }

    /// Whether the launch must stop now, and why.
    fn stop(&self) -> Option<Stop> {
        if cancelled() {
            Some(Stop::Cancelled)
        } else if LAUNCH_EXPIRED.load(Ordering::SeqCst)
            || self.deadline.is_some_and(|d| Instant::now() >= d)
        {
            Some(Stop::TimedOut)
        } else {
            None
        }
    }

    /// `Err` when the launch must stop now.
    fn check(&self) -> Result<(), Abort> {
        self.stop().map_or(Ok(()), |s| Err(Abort::Stop(s)))
    }

    /// How the launch ended early: a step that failed once a stop was asked (say, a call the
    /// alarm or the cancel interrupted, EINTR) ends it stopped, not failed.
    fn explain(&self, abort: Abort) -> Abort {
        match (abort, self.stop()) {
            (Abort::Failed(_), Some(stop)) => Abort::Stop(stop),
            (abort, _) => abort,
        }
    }

    /// Ends the watch: the job has started (its own time limit and cancel are handled while
    /// it runs), or the launch ended.
    fn end(&self) {
        LAUNCHING.store(false, Ordering::SeqCst);
        set_alarm(Duration::ZERO, Duration::ZERO);
    }
}

impl Drop for Launch {
    fn drop(&mut self) {
        self.end();
    }
}

/// Records how a launch ended early in the outcome.
fn record_abort(out: &mut Outcome, abort: Abort) {
    match abort {
        Abort::Stop(Stop::Cancelled) => out.cancelled = true,
        Abort::Stop(Stop::TimedOut) => out.timed_out = true,
        Abort::Failed(e) => {
            out.fault = Some(e.fault());
            out.error = Some(e.to_string());
        }
    }
}

/// An idle task that holds its node under the Docker backend: the shim itself waits, for a
/// cancel or the time limit (which the agent may change), and ends as a stopped task does.
fn hold_docker(jd: &JobDir, spec: &ContainerSpec, out: &mut Outcome) {
    if let Err(e) = install_signal_handlers() {
        record_abort(out, Abort::from(e));
        return;
    }
    let mut limit = crate::jobdir::Deadline::new(Instant::now(), spec.time_limit, Duration::ZERO);
    loop {
        limit.refresh(jd);
        if cancelled() {
            out.cancelled = true;
        } else if limit.at().is_some_and(|d| Instant::now() >= d) {
            out.timed_out = true;
        }
        if out.cancelled || out.timed_out {
            out.signal = Some(libc::SIGTERM);
            return;
        }
        // A cancel's signal ends the wait early (no SA_RESTART).
        // SAFETY: a plain sleep; the handlers only store to atomics.
        unsafe { libc::usleep(250_000) };
    }
}

/// Runs a Docker-backend job: the engine supervises the processes, the shim the job.
fn supervise_docker(jd: &JobDir, spec: &ContainerSpec, target: &crate::DockerTarget) -> Outcome {
    let mut out = Outcome::default();
    // An idle task needs no container: the engine keeps no cgroup of the job's to hold.
    if spec.idle {
        out.started_ms = Some(crate::now_ms());
        if spec.hold {
            // Started, as a task whose program runs: the agent reports the node's part of
            // the job running, and its steps launch there.
            if let Some(ms) = out.started_ms {
                let _ = JobDir::write_private(&jd.started(), ms.to_string().as_bytes());
            }
            hold_docker(jd, spec, &mut out);
        } else {
            out.exit_code = Some(0);
        }
        out.ended_ms = crate::now_ms();
        return out;
    }
    let result = install_signal_handlers()
        .map_err(Abort::from)
        .and_then(|_| {
            let launch = Launch::start(spec.time_limit);
            let launched = || -> Result<_, Abort> {
                let (o, e) = open_outputs(spec, jd, &|| launch.stop())
                    .map_err(|a| a.code(FaultCode::Output))?;
                launch.check()?;
                // The engine sets the container's limits; ask only for what this node can give.
                let spec = apply_limits(spec)?;
                // Names checked before any file is written under the job directory.
                crate::sandbox::plan::check_destinations(&spec)?;
                let spec = crate::docker::with_tmp_files(jd.path(), &spec)?;
                // The engine binds by path: it gets paths the user cannot change (see as_user.rs).
                let staged = as_user::stage_for_engine(jd.path(), &spec, &AsUser::of(&spec))?;
                launch.check()?;
                Ok((o, e, staged))
            };
            let (o, e, (spec, _staged)) = launched().map_err(|a| launch.explain(a))?;
            // The engine's supervision handles the time limit and a cancel from here.
            launch.end();
            Ok(crate::docker::supervise(
                jd,
                &spec,
                target,
                (o, e),
                cancelled,
                &mut out,
            )?)
        });
    if let Err(abort) = result {
        record_abort(&mut out, abort);
    }
    out.ended_ms = crate::now_ms();
    out
}

fn supervise(jd: &JobDir, spec: &ContainerSpec, timeline: &Timeline) -> Outcome {
    if let Some(target) = &spec.docker {
        return supervise_docker(jd, spec, target);
    }
    let mut out = Outcome::default();
    let mut job_cgroup = None;
    let result = install_signal_handlers()
        .map_err(Abort::from)
        .and_then(|_| {
            let launch = Launch::start(spec.time_limit);
            let mut launched = || -> Result<(), Abort> {
                // Held until the job ends: its image is not evicted or removed under it.
                let _pin =
                    pin_image(spec).map_err(|e| Abort::from(e).code(FaultCode::ImageStore))?;
                let (stdout, stderr) = open_outputs(spec, jd, &|| launch.stop())
                    .map_err(|a| a.code(FaultCode::Output))?;
                launch.check()?;
                let (stdin, mut holder) = crate::input::open_input(spec, jd, &|| launch.stop())
                    .map_err(|a| a.code(FaultCode::Supervisor))?;
                // The init inherits the shim's limits (a hard limit cannot be raised inside).
                let spec = &apply_limits(spec).map_err(|e| e.with_code(FaultCode::Sandbox))?;
                let plan = Plan::new(spec, jd.path().join("rootfs"))?;
                // What the user names (a SIF file, bind sources) is opened once, as the user, and
                // those descriptors are what the sandbox uses.
                let user = AsUser::of(spec);
                let sif = match spec.rootfs_partition {
                    Some(_) => Some(
                        as_user::open_sif(&spec.rootfs, &user)
                            .map_err(|e| e.with_code(FaultCode::ImageInvalid))?,
                    ),
                    None => None,
                };
                let trees = as_user::open_user_binds(spec, &user)
                    .map_err(|e| e.with_code(FaultCode::Mount))?;
                let is_dir: Vec<(usize, bool)> = trees.iter().map(|t| (t.bind, t.is_dir)).collect();
                launch.check()?;
                // On cgroup v2 the init is cloned straight into its cgroup, which must exist first;
                // on v1 it has to be moved in anyway, so the cgroup is made while the init mounts.
                if crate::cgroup_usage::is_v2() {
                    job_cgroup = Some(
                        JobCgroup::create(spec, &plan.devices)
                            .map_err(|e| e.with_code(FaultCode::Cgroup))?,
                    );
                    timeline.mark("cgroup");
                }
                let (uid_map, gid_map) = if spec.remap_root {
                    crate::sandbox::userns::root_maps(spec.uid, spec.gid, &spec.groups)
                } else {
                    id_maps(spec.uid, spec.gid, &spec.groups, spec.root_host_id)
                        .map_err(|e| e.with_code(FaultCode::Namespaces))?
                };
                // The shim says on the job's standard error why it stops the job, as slurmstepd
                // does, so that the output file tells a killed job from one that ended.
                let notice = stderr.try_clone().ok();
                let io = InitIo {
                    stdin,
                    stdout,
                    stderr,
                    timeline: timeline.raw_fd(),
                    trees,
                };
                // From here a dropped `init` is killed and reaped: an early return leaves nothing.
                let mut init = sandbox::spawn(&plan, io, job_cgroup.as_ref())
                    .map_err(|e| e.with_code(FaultCode::Sandbox))?;
                init.map_ids(&uid_map, &gid_map)?;
                timeline.mark("identity");
                launch.check()?;
                init.in_mount_ns(|| {
                    let userns = init.userns_path();
                    crate::sandbox::rootfs::prepare_root(
                        spec,
                        jd.path(),
                        &userns,
                        sif.as_ref(),
                        &is_dir,
                    )
                })?;
                timeline.mark("root");
                launch.check()?;
                if job_cgroup.is_none() {
                    init.build()?;
                    let cg = JobCgroup::create(spec, &plan.devices)
                        .map_err(|e| init.explain(e.with_code(FaultCode::Cgroup)))?;
                    let cg = job_cgroup.insert(cg);
                    cg.join(init.pid())
                        .map_err(|e| init.explain(e.with_code(FaultCode::Cgroup)))?;
                    timeline.mark("cgroup");
                }
                if !init.start(|| launch.stop().is_some())? {
                    // It gave up because a stop was asked (and a stop, once asked, stays).
                    return Err(Abort::Stop(launch.stop().unwrap_or(Stop::Cancelled)));
                }
                timeline.mark("started");
                launch.end();
                run(jd, &init, spec, holder.as_mut(), notice, &mut out);
                Ok(())
            };
            launched().map_err(|a| launch.explain(a))
        });
    if let Err(abort) = result {
        record_abort(&mut out, abort);
    }
    // Whatever happened, nothing of the job is left: no process, no cgroup.
    kill_all(spec);
    out.oom = cgroup::oom_kills(&spec.cgroup_path()) > 0;
    // The counters go with the cgroup: read them while it is there.
    out.usage = job_cgroup
        .is_some()
        .then(|| cgroup::usage(&spec.cgroup_path()));
    if let Some(mut cg) = job_cgroup {
        cg.remove();
    }
    reap_all();
    out.ended_ms = crate::now_ms();
    out
}

/// Pins the job's image when it is one of the node's store (a directory with a pin file
/// beside it): the image cache's eviction and `wharf image rm` leave it alone while the shim
/// holds it, whatever happens to the agent.
fn pin_image(spec: &ContainerSpec) -> Result<Option<wharf_images::Pin>, RuntimeError> {
    if spec.rootfs_partition.is_some() || spec.rootfs == Path::new("/") {
        return Ok(None);
    }
    if !spec.rootfs.with_file_name("pin").is_file() {
        return Ok(None);
    }
    wharf_images::Pin::rootfs(&spec.rootfs)
        .map(Some)
        .map_err(|e| {
            RuntimeError::new(
                crate::error::ErrorKind::NotFound,
                format!("the job's image: {e}"),
            )
        })
}

/// Supervises the started job to its end.
fn run(
    jd: &JobDir,
    init: &Init,
    spec: &ContainerSpec,
    holder: Option<&mut Holder>,
    notice: Option<std::os::fd::OwnedFd>,
    out: &mut Outcome,
) {
    let started = Instant::now();
    out.started_ms = Some(crate::now_ms());
    if let Some(ms) = out.started_ms {
        let _ = JobDir::write_private(&jd.started(), ms.to_string().as_bytes());
    }
    let status = wait_init(jd, init, spec, started, holder, notice, out);
    match status {
        // The init exits as its program did: 128 + the signal that killed it, said apart.
        WaitStatus::Exited(_, code) => match init.program_signal() {
            Some(sig) => out.signal = Some(sig),
            None => out.exit_code = Some(code),
        },
        WaitStatus::Signaled(_, sig, _) => out.signal = Some(sig as i32),
        _ => {}
    }
}

/// Waits for the container's init, enforcing the time limit and cancellation; the task's
/// input pipe is let go once the agent wrote its end (the agent's SIGUSR1 wakes the wait).
fn wait_init(
    jd: &JobDir,
    init: &Init,
    spec: &ContainerSpec,
    started: Instant,
    mut holder: Option<&mut Holder>,
    notice: Option<std::os::fd::OwnedFd>,
    out: &mut Outcome,
) -> WaitStatus {
    // Looked for at each wake of the wait, which is at most a second apart.
    let mut limit = crate::jobdir::Deadline::new(started, spec.time_limit, Duration::ZERO);
    let grace = Duration::from_secs(spec.grace_secs);
    let mut kill_at: Option<Instant> = None;
    // An idle task runs nothing of the user's to signal: its default dispositions would
    // only end it, and its node's part of the job with it.
    if !spec.idle {
        if let Err(e) = crate::signals::open(jd) {
            eprintln!("wharf shim: this task takes no signals: {e}");
        }
    }
    loop {
        // A limit changed since the launch (the agent writes it) counts from the start too.
        if !out.timed_out {
            limit.refresh(jd);
        }
        let deadline = limit.at();
        if let Some(h) = holder.as_deref_mut() {
            if !h.release_when_ended() {
                holder = None;
            }
        }
        if let Ok(status @ (WaitStatus::Exited(..) | WaitStatus::Signaled(..))) =
            waitpid(init.pid(), Some(WaitPidFlag::WNOHANG))
        {
            crate::signals::close(jd);
            return status;
        }
        let now = Instant::now();
        let stopping = out.cancelled || out.timed_out;
        // Read before the requests are: the agent writes a signal ordered with a cancel
        // before it signals the cancel, so a cancel seen here comes after every request
        // that goes before it, and those are delivered first.
        let cancel = !stopping && cancelled();
        if !stopping {
            for req in crate::signals::take(jd) {
                deliver(spec, init.pid(), req);
            }
        }
        if cancel {
            out.cancelled = true;
        } else if !stopping && deadline.is_some_and(|d| now >= d) {
            out.timed_out = true;
        }
        if !stopping && (out.cancelled || out.timed_out) {
            // A stopping job's processes take only the stop's signals from here on.
            crate::signals::close(jd);
            signal_all(spec, init.pid(), Signal::SIGTERM);
            kill_at = Some(now + grace);
            // Why, as the agent recorded the stop order it passed on.
            let why = std::fs::read_to_string(jd.stop()).ok();
            let line = stop_notice(spec, out.timed_out, why.as_deref(), crate::now_ms() / 1000);
            if let (Some(fd), Some(line)) = (&notice, line) {
                tell(fd, &line);
            }
        }
        if kill_at.is_some_and(|k| now >= k) {
            // The init is pid 1 of the job's pid namespace: the kernel kills the rest with it.
            signal_all(spec, init.pid(), Signal::SIGKILL);
            kill_at = Some(now + Duration::from_secs(1)); // repeat until init is gone
        }
        let next = [deadline.filter(|_| kill_at.is_none()), kill_at]
            .into_iter()
            .flatten()
            .min()
            .map(|t| t.saturating_duration_since(now))
            .unwrap_or(Duration::from_secs(1))
            .min(Duration::from_secs(1));
        // A cancel (a signal) ends the wait early; the loop then sees it.
        init.exits_within(next.as_millis().max(1) as u16);
    }
}

/// Writes `line` to `fd` (the job's standard error) from a child of its own, reaped with the
/// rest: a write to a file on a filesystem that stops answering must not hold up the stop
/// of the job. The shim is single-threaded, so the fork is safe.
fn tell(fd: &std::os::fd::OwnedFd, line: &str) {
    // SAFETY: the child makes one write and leaves without running any destructor.
    if let Ok(nix::unistd::ForkResult::Child) = unsafe { nix::unistd::fork() } {
        let _ = nix::unistd::write(fd, line.as_bytes());
        unsafe { libc::_exit(0) }
    }
}

/// The line written to a job's standard error as the shim stops it, at `now` (seconds since
/// the epoch), in slurmstepd's words: `*** JOB 12 ON gpu01 CANCELLED AT 2026-11-28T01:40:00Z
/// DUE TO TIME LIMIT ***` (`STEP 12.3` for a step; `DUE TO PREEMPTION`, `JOB REQUEUE` or
/// `NODE FAILURE` as `why`, the agent's stop order, says; none for a cancel). None for a run
/// the controller has moved on from ([`wharf_api::wire::NOT_ACTIVE_HERE`]): another run of
/// the job may be writing its output by then.
fn stop_notice(
    spec: &ContainerSpec,
    timed_out: bool,
    why: Option<&str>,
    now: u64,
) -> Option<String> {
    let why = why.unwrap_or("").trim();
    if !timed_out && why == wharf_api::wire::NOT_ACTIVE_HERE {
        return None;
    }
    let var = |name: &str| {
        let prefix = format!("{name}=");
        (spec.env.iter()).find_map(|e| e.strip_prefix(prefix.as_str()).map(str::to_string))
    };
    let what = match (var("SLURM_JOB_ID"), var("SLURM_STEP_ID")) {
        (Some(job), Some(step)) => format!("STEP {job}.{step}"),
        (Some(job), None) => format!("JOB {job}"),
        _ => format!("JOB {}", spec.id),
    };
    // The words of the controller's stops (`wharf_api::Stop`'s).
    let due = if timed_out {
        " DUE TO TIME LIMIT"
    } else if why.starts_with("preempted by") {
        " DUE TO PREEMPTION"
    } else if why.starts_with("requeued by") {
        " DUE TO JOB REQUEUE"
    } else if why.ends_with("stopped responding") {
        " DUE TO NODE FAILURE"
    } else {
        ""
    };
    Some(format!(
        "wharf: *** {what} ON {} CANCELLED AT {}Z{due} ***\n",
        spec.hostname,
        wharf_api::forms::format_utc(now)
    ))
}

/// Sends `sig` once to the init and to every other process in the job's cgroup (the init is
/// in the cgroup too: signalled twice, a job that traps TERM would run its handler twice).
fn signal_all(spec: &ContainerSpec, init: Pid, sig: Signal) {
    // The init is this process's child, not reaped yet: its pid is still its own.
    let _ = nix::sys::signal::kill(init, sig);
    let others = cgroup::pids(&spec.cgroup_path()).into_iter();
    send_in_cgroup(spec, others.filter(|&pid| pid != init.as_raw()), sig);
}

/// Sends `sig` to those of `pids` that are the job's processes. A pid read from the cgroup
/// may have ended and been taken over by a process outside the job before it is signalled:
/// each is opened as a pidfd first (which then stays that process, whatever becomes of the
/// pid), and only those the cgroup still lists after the opening are sent it.
fn send_in_cgroup(spec: &ContainerSpec, pids: impl Iterator<Item = i32>, sig: Signal) {
    let mut opened: Vec<(i32, std::os::fd::OwnedFd)> = Vec::new();
    for pid in pids {
        let Ok(p) = u32::try_from(pid) else { continue };
        // Gone, or signalled by pid already when no pidfd is to be had.
        if let Ok(Some(fd)) = crate::sys::pidfd_or_kill(p, sig) {
            opened.push((pid, fd));
        }
    }
    if opened.is_empty() {
        return;
    }
    let still: std::collections::BTreeSet<i32> =
        cgroup::pids(&spec.cgroup_path()).into_iter().collect();
    for (pid, fd) in opened {
        if still.contains(&pid) {
            let _ = crate::sys::pidfd_send_signal(&fd, sig);
        }
    }
}

/// Sends a user's signal (`wharf cancel --signal`) to the job's processes: all of them, as
/// [`signal_all`] does, or only the program the init runs (a batch script's shell).
fn deliver(spec: &ContainerSpec, init: Pid, req: crate::signals::Request) {
    let Some(sig) = req.to_send() else {
        return;
    };
    if !req.script_only {
        signal_all(spec, init, sig);
        return;
    }
    // The program is the init's first child: processes orphaned in the job become children
    // of the init too, but only after the program started them.
    let program = (cgroup::pids(&spec.cgroup_path()).into_iter())
        .filter_map(|pid| Some((crate::sys::parent_and_start(pid as u32)?, pid)))
        .filter(|&((parent, _), _)| parent == init.as_raw() as u32)
        .map(|((_, started), pid)| (started, pid))
        .min()
        .map(|(_, pid)| pid);
    send_in_cgroup(spec, program.into_iter(), sig);
}

/// Kills every process in the job's cgroup until none is left (5 s at most).
fn kill_all(spec: &ContainerSpec) {
    let gone_by = Instant::now() + Duration::from_secs(5);
    loop {
        let pids = cgroup::pids(&spec.cgroup_path());
        if pids.is_empty() || Instant::now() > gone_by {
            break;
        }
        send_in_cgroup(spec, pids.into_iter(), Signal::SIGKILL);
        reap_all();
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// After a shim died without an outcome: kill what is left of its job and remove it.
pub(crate) fn clean_up_after_lost_shim(spec: &ContainerSpec) {
    if let Some(target) = &spec.docker {
        let _ = crate::docker::remove(target, &spec.id);
        return;
    }
    kill_all(spec);
    JobCgroup::remove_all(spec);
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
/// the init inherits it.
fn set_memlock(want: Option<u64>) -> Result<u64, RuntimeError> {
    set_limit(
        Resource::RLIMIT_MEMLOCK,
        want.unwrap_or(libc::RLIM_INFINITY)
            .min(crate::sandbox::limits::memlock_ceiling()),
    )
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

#[cfg(test)]
mod tests {
    use super::*;
    use nix::fcntl::OFlag;
    use nix::sys::stat::Mode;
    use nix::unistd::{fork, ForkResult};

    #[test]
    fn a_docker_task_that_holds_its_node_starts_and_waits_to_its_time_limit() {
        let dir = tempfile::tempdir().unwrap();
        let jd = JobDir::new(dir.path().to_path_buf());
        let mut spec = crate::conformance::template("wharf-12", Path::new("/"), 1, 1);
        (spec.idle, spec.hold, spec.time_limit) = (true, true, Some(1));
        let target = crate::DockerTarget {
            socket: "/nonexistent/docker.sock".into(),
            image: "none".into(),
        };
        let begun = Instant::now();
        let out = supervise_docker(&jd, &spec, &target);
        // It said it started (the engine is never asked), then held until its limit.
        assert!(jd.started().exists());
        assert!(out.timed_out && !out.cancelled, "{out:?}");
        assert_eq!(out.signal, Some(libc::SIGTERM));
        assert!(begun.elapsed() >= Duration::from_secs(1));
        // One that does not hold ends at once with 0.
        spec.hold = false;
        let out = supervise_docker(&jd, &spec, &target);
        assert_eq!((out.exit_code, out.timed_out), (Some(0), false));
    }

    #[test]
    fn the_stop_notice_names_the_job_or_step_its_node_and_why() {
        let mut spec = crate::conformance::template("wharf-12", Path::new("/"), 1, 1);
        spec.hostname = "gpu01".into();
        spec.env = vec!["SLURM_JOB_ID=12".into()];
        // 2026-11-28T01:40:00Z.
        let at = 1_795_830_000;
        assert_eq!(
            stop_notice(&spec, true, None, at).unwrap(),
            "wharf: *** JOB 12 ON gpu01 CANCELLED AT 2026-11-28T01:40:00Z DUE TO TIME LIMIT ***\n"
        );
        // The stops' words are the controller's own.
        let stop = |s: wharf_api::Stop| s.to_string();
        for (why, due) in [
            (
                stop(wharf_api::Stop::Preempt {
                    by: 3,
                    requeue: true,
                }),
                " DUE TO PREEMPTION",
            ),
            (
                stop(wharf_api::Stop::Requeue {
                    by_user: "ann".into(),
                }),
                " DUE TO JOB REQUEUE",
            ),
            (
                stop(wharf_api::Stop::NodeLost {
                    node: "g2".into(),
                    requeue: true,
                }),
                " DUE TO NODE FAILURE",
            ),
            ("cancelled".to_string(), ""),
        ] {
            let text = stop_notice(&spec, false, Some(why.as_str()), at).unwrap();
            assert!(text.ends_with(&format!("Z{due} ***\n")), "{why}: {text}");
        }
        // A run the controller moved on from says nothing: another may own the output now.
        let moved_on = Some(wharf_api::wire::NOT_ACTIVE_HERE);
        assert_eq!(stop_notice(&spec, false, moved_on, at), None);
        spec.env.push("SLURM_STEP_ID=3".into());
        assert_eq!(
            stop_notice(&spec, false, None, at).unwrap(),
            "wharf: *** STEP 12.3 ON gpu01 CANCELLED AT 2026-11-28T01:40:00Z ***\n"
        );
    }

    /// In a child process (the alarm and the handlers are process-wide): starts a launch
    /// watch, then opens a FIFO nobody writes to, twice, each a blocking open that is not
    /// retried. Returns the child's exit code: 0 when both opens were interrupted and the
    /// launch ended as `expect`; 1, 2 otherwise; killed after 20 s.
    fn launch_held_by_a_fifo(time_limit: Option<u64>, cancel: bool, expect: Stop) -> i32 {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, Mode::from_bits_truncate(0o600)).unwrap();
        // SAFETY: the child only makes system calls, then _exits.
        match unsafe { fork() }.unwrap() {
            ForkResult::Child => {
                let code = (|| {
                    install_signal_handlers().ok()?;
                    let launch = Launch::start(time_limit);
                    for _ in 0..2 {
                        let opened = nix::fcntl::open(&fifo, OFlag::O_RDONLY, Mode::empty());
                        if opened != Err(nix::Error::EINTR) {
                            return Some(1);
                        }
                    }
                    let failed = Abort::Failed(RuntimeError::sys("open", nix::Error::EINTR));
                    match launch.explain(failed) {
                        Abort::Stop(stop) if stop == expect => Some(0),
                        _ => Some(2),
                    }
                })()
                .unwrap_or(3);
                // SAFETY: leaving the forked test process at once.
                unsafe { libc::_exit(code) }
            }
            ForkResult::Parent { child } => {
                if cancel {
                    std::thread::sleep(Duration::from_millis(500));
                    nix::sys::signal::kill(child, Signal::SIGTERM).unwrap();
                }
                let give_up = Instant::now() + Duration::from_secs(20);
                loop {
                    match waitpid(child, Some(WaitPidFlag::WNOHANG)).unwrap() {
                        WaitStatus::Exited(_, code) => return code,
                        WaitStatus::StillAlive if Instant::now() < give_up => {
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        other => {
                            let _ = nix::sys::signal::kill(child, Signal::SIGKILL);
                            let _ = waitpid(child, None);
                            panic!("the launch was still held after 20 s ({other:?})");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn no_launch_step_waits_past_the_time_limit() {
        let t = Instant::now();
        assert_eq!(launch_held_by_a_fifo(Some(1), false, Stop::TimedOut), 0);
        assert!(t.elapsed() >= Duration::from_secs(1), "{:?}", t.elapsed());
    }

    #[test]
    fn one_cancel_ends_a_held_launch_cancelled_however_often_it_waits_again() {
        assert_eq!(launch_held_by_a_fifo(None, true, Stop::Cancelled), 0);
    }
}
